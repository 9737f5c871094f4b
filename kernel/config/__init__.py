"""Config models and loading shared by every part: Kafka, connections, policies, connector bases.

* :mod:`kernel.config.models` - the Kafka connection, named connections, batch and retry
  policies, and the base models of every connector's config.
* :mod:`kernel.config.loader` - YAML to validated pydantic models, with each key's line
  and ``${env:NAME}`` / ``${file:path}`` resolved.
* :mod:`kernel.config.safety` - the allow-lists of pass-through options.

The whole pipeline document is assembled above the parts, in :mod:`threes.config`
(``load_pipeline``); the stream job's section is :mod:`stream_app.config`, the sync
services' :mod:`sync_service.config`.
"""
