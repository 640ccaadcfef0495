"""API keys, as hashes only (the key itself is shown once, when made, and never stored); each change audited."""

from __future__ import annotations

from sqlalchemy import select

from .audit import audit_entry
from .database import Database, iso, now
from .models import ApiKey


class ApiKeys:
    def __init__(self, database: Database):
        self._database = database

    def add(self, prefix: str, key_hash: str, name: str, tier: str, actor: str) -> dict:
        with self._database.transaction(write=True) as session:
            row = ApiKey(prefix=prefix, key_hash=key_hash, name=name, tier=tier, created_at=now())
            session.add(row)
            session.flush()
            session.add(audit_entry(row.created_at, actor, "api_key.create", f"api_key:{row.id}", None,
                                    {"name": name, "tier": tier, "prefix": prefix}))
            return _key_dict(row)

    def revoke(self, key_id: int, actor: str) -> dict | None:
        """The key as revoked (now or before); None when there is none with that id."""
        with self._database.transaction(write=True) as session:
            row = session.get(ApiKey, key_id)
            if row is None:
                return None
            if row.revoked_at is None:
                row.revoked_at = now()
                session.add(audit_entry(row.revoked_at, actor, "api_key.revoke", f"api_key:{row.id}", "active",
                                        "revoked"))
            return _key_dict(row)

    def all(self) -> list[dict]:
        """Every key, revoked ones too, oldest first."""
        with self._database.transaction() as session:
            return [_key_dict(row) for row in session.scalars(select(ApiKey).order_by(ApiKey.id))]


def _key_dict(row: ApiKey) -> dict:
    return {"id": row.id, "prefix": row.prefix, "key_hash": row.key_hash, "name": row.name, "tier": row.tier,
            "created_at": iso(row.created_at), "revoked_at": iso(row.revoked_at) if row.revoked_at else None}
