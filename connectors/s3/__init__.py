"""Amazon S3 and S3-compatible servers through boto3: ``S3Source`` and ``S3Sink``."""
