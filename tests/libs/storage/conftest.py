from tests.libs.storage.helpers import empty_database, migrated_postgres_url, repository, store_database_url  # noqa: F401
