"""Alembic environment: run on the connection or URL that storage.Storage.migrate hands over."""

from alembic import context
from sqlalchemy import create_engine

from storage.models import Base

config = context.config
connection = config.attributes.get("connection")
if connection is None:
    with create_engine(config.get_main_option("sqlalchemy.url")).connect() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()
