"""Apache Iceberg tables through pyiceberg: ``IcebergSink`` and the ``iceberg`` connection (SQL or REST catalog)."""
