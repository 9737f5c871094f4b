"""Safe by default: allow-listed pass-through options, ${file:} confined, secrets out of URLs and reprs."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from connectors.elasticsearch.connection import ElasticsearchConnection
from connectors.rds.connection import RdsConnection
from kernel.config.models import KafkaConfig
from kernel.exceptions import ConfigError
from stream_app.spark_settings import SparkSettings
from tests.unit.test_config import MINIMAL, write
from threes.config import load_pipeline


def test_safe_kafka_tuning_passes_and_unknown_keys_are_refused() -> None:
    kafka = KafkaConfig(bootstrap_servers="b:9092", client_config={"linger.ms": 5, "client.id": "x", "acks": "all",
                                                                    "debug": "broker,cgrp"})
    assert kafka.librdkafka_config()["linger.ms"] == 5
    with pytest.raises(ValidationError, match="'made.up.option' refused: not on the allow-list"):
        KafkaConfig(bootstrap_servers="b:9092", client_config={"made.up.option": 1})
    with pytest.raises(ValidationError, match="'acks' refused"):
        KafkaConfig(bootstrap_servers="b:9092", client_config={"acks": 1})
    with pytest.raises(ValidationError, match="'ssl.cipher.suites' refused: a TLS/SASL setting"):
        KafkaConfig(bootstrap_servers="b:9092", client_config={"ssl.cipher.suites": "NULL"})


def test_url_options_are_allow_listed_and_a_query_password_is_masked() -> None:
    conn = RdsConnection(type="rds", url="postgresql+psycopg://u@h:5432/db?sslmode=verify-full&sslrootcert=/ca.pem"
                         "&password=hunter2")
    assert "hunter2" not in conn.url and "hunter2" not in repr(conn)
    assert conn.password.get_secret_value() == "hunter2"
    assert conn.sqlalchemy_url().query == {"sslmode": "verify-full", "sslrootcert": "/ca.pem"}
    with pytest.raises(ValidationError, match="url option 'service' refused"):
        RdsConnection(type="rds", url="postgresql+psycopg://u@h/db?service=x")
    with pytest.raises(ValidationError, match="url option 'init_command' refused: runs SQL"):
        RdsConnection(type="rds", url="mysql+pymysql://u@h/db?init_command=SET%20x%3D1")
    with pytest.raises(ValidationError, match="'ssl_verify_cert' refused"):
        RdsConnection(type="rds", url="mysql+pymysql://u@h/db?ssl_verify_cert=false")
    assert RdsConnection(type="rds", url="mysql+pymysql://u@h/db?charset=utf8mb4").url.endswith("charset=utf8mb4")


def test_elasticsearch_credentials_leave_the_host_and_unverified_tls_needs_consent() -> None:
    conn = ElasticsearchConnection(type="elasticsearch", hosts=["https://elastic:hunter2@127.0.0.1:9200/"])
    assert conn.hosts == ["https://127.0.0.1:9200/"]
    assert conn.username == "elastic" and conn.password.get_secret_value() == "hunter2"
    assert "hunter2" not in repr(conn) and "hunter2" not in str(conn)
    with pytest.raises(ValidationError, match="accept_unverified_certificates"):
        ElasticsearchConnection(type="elasticsearch", hosts=["https://h:9200"], verify_certs=False)
    ok = ElasticsearchConnection(type="elasticsearch", hosts=["https://h:9200"], verify_certs=False,
                                 accept_unverified_certificates=True)
    assert ok.verify_certs is False


def test_spark_conf_allow_list_acknowledgement_and_masking() -> None:
    settings = SparkSettings(conf={"spark.sql.shuffle.partitions": "8", "spark.executor.memory": "2g",
                                   "spark.hadoop.fs.s3a.secret.key": "hunter2",
                                   "spark.executor.extraJavaOptions": "-XX:+UseG1GC -Duser.timezone=UTC"})
    assert "hunter2" not in repr(settings)
    assert settings.conf["spark.hadoop.fs.s3a.secret.key"] == "hunter2"
    for key, value in [("spark.archives", "hdfs:///venv.tgz#env"), ("spark.sql.extensions", "evil.Ext"),
                       ("spark.plugins", "evil.Plugin"), ("spark.redaction.regex", "nothing"),
                       ("spark.driver.resource.gpu.discoveryScript", "/tmp/x.sh"), ("spark.made.up", "1"),
                       ("spark.executor.extraJavaOptions", "-XX:OnOutOfMemoryError=/tmp/x.sh")]:
        with pytest.raises(ValidationError, match=f"conf '{key}' refused"):
            SparkSettings(conf={key: value})
    jit = "-XX:CompileThresholdScaling=0.5 -XX:TieredStopAtLevel=1 -XX:-TieredCompilation -XX:CICompilerCount=2 " \
          "-XX:ReservedCodeCacheSize=256m -XX:MaxInlineLevel=6 -XX:MaxInlineSize=20 -XX:FreqInlineSize=200 " \
          "-XX:InlineSmallCode=1000"  # when and how much the JIT compiles and inlines: no code, no files
    assert SparkSettings(conf={"spark.executor.extraJavaOptions": jit}).conf["spark.executor.extraJavaOptions"] == jit
    for flag in ("-XX:CompileThresholdScaling=x", "-XX:TieredStopAtLevel=5", "-XX:CompileCommandFile=/tmp/c",
                 "-XX:MaxInlineLevel=-1", "-XX:InlineSmallCode=1k"):
        with pytest.raises(ValidationError, match="not on the allow-list"):
            SparkSettings(conf={"spark.executor.extraJavaOptions": flag})
    acknowledged = SparkSettings(conf={"spark.archives": "hdfs:///venv.tgz#env"},
                                 acknowledge_code_loading=["spark.archives"])
    assert acknowledged.conf["spark.archives"] == "hdfs:///venv.tgz#env"
    with pytest.raises(ValidationError, match="-javaagent"):  # never acknowledged: checked flag by flag
        SparkSettings(conf={"spark.driver.extraJavaOptions": "-javaagent:/a.jar"},
                      acknowledge_code_loading=["spark.driver.extraJavaOptions"])


def test_file_references_stay_under_the_config_folder(tmp_path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "secrets" / "pg").write_text("from-file\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir(exist_ok=True)
    (outside / "pg").write_text("outside\n")
    (tmp_path / "secrets" / "link").symlink_to(outside / "pg")
    good = MINIMAL.replace("${env:THREES_PGPASS}", "${file:secrets/pg}")
    assert load_pipeline(write(tmp_path, good), environ={}).connections["pg"].password.get_secret_value() == "from-file"
    for ref in ("secrets/link", f"{outside}/pg", f"../{outside.name}/pg"):
        with pytest.raises(ConfigError, match="outside the config's folder"):
            load_pipeline(write(tmp_path, MINIMAL.replace("${env:THREES_PGPASS}", f"${{file:{ref}}}")), environ={})
    allowed = load_pipeline(write(tmp_path, MINIMAL.replace("${env:THREES_PGPASS}", f"${{file:{outside}/pg}}")),
                            environ={"THREES_FILE_REF_DIRS": str(outside)})
    assert allowed.connections["pg"].password.get_secret_value() == "outside"


def test_postgres_sslmode_without_certificate_verification_is_refused_like_mysql_ssl_disabled() -> None:
    # MySQL's ssl_disabled and ssl_verify_cert=false are refused: PostgreSQL's equivalents too
    with pytest.raises(ValidationError, match="'ssl_disabled' refused: turns TLS off"):
        RdsConnection(type="rds", url="mysql+pymysql://u@h/db?ssl_disabled=true")
    for mode, why in [("disable", "turns TLS off"), ("allow", "falls back to a connection without TLS"),
                      ("prefer", "falls back to a connection without TLS"),
                      ("require", "skips server certificate verification"), ("REQUIRE", "skips server")]:
        with pytest.raises(ValidationError, match=f"url option 'sslmode' refused: {mode} .*{why}.*verify-full"):
            RdsConnection(type="rds", url=f"postgresql+psycopg://u@h:5432/db?sslmode={mode}")
    for mode in ("verify-ca", "verify-full"):
        conn = RdsConnection(type="rds", url=f"postgresql+psycopg://u@h:5432/db?sslmode={mode}&sslrootcert=/ca.pem")
        assert conn.sqlalchemy_url().query["sslmode"] == mode
    assert RdsConnection(type="rds", url="postgresql+psycopg://u@h:5432/db").sqlalchemy_url().query == {}


def test_spark_default_data_source_takes_built_in_short_names_only() -> None:
    for name in ("parquet", "orc", "json", "csv", "avro", "text", "Parquet"):
        assert SparkSettings(conf={"spark.sql.sources.default": name}).conf["spark.sql.sources.default"] == name
    for name in ("com.evil.DefaultSource", "org.apache.spark.sql.execution.datasources.parquet", "delta"):
        with pytest.raises(ValidationError, match="conf 'spark.sql.sources.default' refused: .* not a built-in"):
            SparkSettings(conf={"spark.sql.sources.default": name})
    # the documented opt-in for settings that load code
    acknowledged = SparkSettings(conf={"spark.sql.sources.default": "io.delta.sql.DeltaSource"},
                                 acknowledge_code_loading=["spark.sql.sources.default"])
    assert acknowledged.conf["spark.sql.sources.default"] == "io.delta.sql.DeltaSource"


def test_env_references_read_only_allow_listed_variables(tmp_path) -> None:
    secret = "AKIA-not-for-the-config"
    text = MINIMAL.replace("${env:THREES_PGPASS}", "${env:AWS_SECRET_ACCESS_KEY}")
    with pytest.raises(ConfigError) as err:
        load_pipeline(write(tmp_path, text), environ={"AWS_SECRET_ACCESS_KEY": secret})
    message = str(err.value)
    assert "connections.pg.password" in message and ":8:" in message
    assert "${env:AWS_SECRET_ACCESS_KEY} is not on the allow-list" in message
    assert "THREES_ENV_REFS=AWS_SECRET_ACCESS_KEY" in message and secret not in message
    # a default does not open the door either
    with pytest.raises(ConfigError, match="not on the allow-list"):
        load_pipeline(write(tmp_path, text.replace("AWS_SECRET_ACCESS_KEY}", "AWS_SECRET_ACCESS_KEY:-x}")),
                      environ={"AWS_SECRET_ACCESS_KEY": secret})
    # the process (never the file) allows more, by name or pattern
    for allow in ("AWS_SECRET_ACCESS_KEY", "AWS_*", "*"):
        pipeline = load_pipeline(write(tmp_path, text), environ={"AWS_SECRET_ACCESS_KEY": secret,
                                                                 "THREES_ENV_REFS": f"OTHER, {allow}"})
        assert pipeline.connections["pg"].password.get_secret_value() == secret
    assert load_pipeline(write(tmp_path, MINIMAL), environ={"THREES_PGPASS": "x"})


@pytest.mark.parametrize("url", [
    "postgresql+psycopg://u@h/db?sslmode=verify-full&sslrootcert=/etc/shadow",
    "postgresql+psycopg://u@h/db?sslmode=verify-full&sslcrl=/etc/shadow",
    "postgresql+psycopg://u@h/db?sslmode=verify-full&sslrootcert=../../../../etc/shadow",
    "mysql+pymysql://u@h/db?ssl_ca=/etc/shadow",
    "sqlite:////etc/shadow",
    "sqlite:///../../../../etc/passwd",
])
def test_files_a_database_url_names_are_confined_like_file_references(tmp_path, url: str) -> None:
    text = MINIMAL.replace("url: postgresql+psycopg://threes@127.0.0.1:15432/threes", f"url: '{url}'")
    assert text != MINIMAL
    with pytest.raises(ConfigError, match=r"connections\.pg.*names a file outside the config's folder"):
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})


def test_files_under_the_config_folder_or_allowed_directories_pass(tmp_path) -> None:
    (tmp_path / "ca.pem").write_text("x")
    base = "postgresql+psycopg://threes@127.0.0.1:15432/threes"
    for url in (f"{base}?sslmode=verify-full&sslrootcert=ca.pem", f"{base}?sslmode=verify-full&sslrootcert=system",
                "sqlite:///local.db", "sqlite://"):
        text = MINIMAL.replace(f"url: {base}", f"url: '{url}'")
        load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x"})
    text = MINIMAL.replace(f"url: {base}", f"url: '{base}?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem'")
    load_pipeline(write(tmp_path, text), environ={"THREES_PGPASS": "x", "THREES_FILE_REF_DIRS": "/etc/ssl"})
