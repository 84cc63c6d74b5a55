"""The database kernel: pools, the transaction runner, error translation and the clock."""

from orbit_common.db.clock import db_now
from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.db.tx import Isolation

__all__ = ["Database", "DatabaseUrl", "Isolation", "db_now", "open_database"]
