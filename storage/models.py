"""Tables. Values are stored as JSON text with their type name, so any scalar round-trips."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from sqlalchemy import Boolean, DateTime, Float, Integer, LargeBinary, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class JobStatus(StrEnum):
    """A job's way: queued -> running -> succeeded or failed (or back to queued, to try again); cancelled from
    queued or running."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class Setting(Base):
    __tablename__ = "settings"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)  # JSON
    value_type: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_by: Mapped[str] = mapped_column(String(128))


class AuditEntry(Base):
    __tablename__ = "audit_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    actor: Mapped[str] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(64))
    old_value: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON
    new_value: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON


class RequestLogEntry(Base):
    __tablename__ = "request_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    client: Mapped[str] = mapped_column(String(128))
    source: Mapped[str] = mapped_column(String(16))
    voice: Mapped[str | None] = mapped_column(String(128), nullable=True)
    characters: Mapped[int] = mapped_column(Integer, default=0)
    queue_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    synthesis_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    batch_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[int] = mapped_column(Integer)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    prefix: Mapped[str] = mapped_column(String(16))  # shown to operators to tell keys apart
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)  # sha256 hex; the key itself is never stored
    name: Mapped[str] = mapped_column(String(128))
    tier: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Job(Base):
    """An asynchronous speech job: a text, or a dialogue's script (its request has `voices`). Its result is a file
    (result_path) kept until expires_at."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    owner: Mapped[str] = mapped_column(String(128), index=True)  # the caller's identity: key:<id> or ip:<address>
    tier: Mapped[str] = mapped_column(String(64))
    priority: Mapped[int] = mapped_column(Integer)  # claim order: higher first (the tier's, then the caller's)
    status: Mapped[str] = mapped_column(String(16), index=True)  # a JobStatus
    request: Mapped[str] = mapped_column(Text)  # JSON: input (or script), voice (or voices), model, speed, format...
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    not_before: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # retry backoff
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    result_path: Mapped[str | None] = mapped_column(String(512), nullable=True)
    content_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    audio_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    # while running: the replica whose claim it is, and until when (renewed while it runs; once past, any
    # replica queues the job again)
    lease_owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # a dialogue's: its turns in all, and how many the attempt running (or the last) has made
    turns: Mapped[int | None] = mapped_column(Integer, nullable=True)
    turns_done: Mapped[int | None] = mapped_column(Integer, nullable=True)
    captions: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON, when asked for: words and turns


class ReplicaRow(Base):
    """One server process of a deployment, as it last reported itself (every second while it runs)."""

    __tablename__ = "replicas"

    id: Mapped[str] = mapped_column(String(128), primary_key=True)  # TTS_REPLICA_ID
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    seen_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    figures: Mapped[str] = mapped_column(Text)  # JSON: queue, running, batch size, load score, degrade, GPU


class ClonedVoiceRow(Base):
    """A voice made from a caller's clip. Its voice prompt (the model's latents) is the file at path, under
    each replica's data dir, made from the bytes in prompt (rows from before they were kept: the file only)."""

    __tablename__ = "cloned_voices"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)  # unique among cloned voices
    model: Mapped[str] = mapped_column(String(128))  # the loaded model (engine) whose codec made the prompt
    owner: Mapped[str] = mapped_column(String(128), index=True)  # the caller's identity: key:<id> or ip:<address>
    public: Mapped[bool] = mapped_column(Boolean, default=False)  # usable by everyone (an admin's decision)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    duration_s: Mapped[float] = mapped_column(Float)  # of the clip
    transcript: Mapped[str | None] = mapped_column(Text, nullable=True)  # what the clip says, if the caller said
    path: Mapped[str] = mapped_column(String(512))
    consent_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # when the caller affirmed consent
    # deferred: the list, read every second by every replica, leaves the prompts out
    prompt: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True, deferred=True)


class LexiconRow(Base):
    """A pronunciation lexicon entry: a word or phrase of a language, said with IPA and/or a respelling."""

    __tablename__ = "lexicon"
    __table_args__ = (UniqueConstraint("language", "phrase"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    language: Mapped[str] = mapped_column(String(16))
    phrase: Mapped[str] = mapped_column(String(128))
    ipa: Mapped[str | None] = mapped_column(String(256), nullable=True)
    respelling: Mapped[str | None] = mapped_column(String(256), nullable=True)
    case_sensitive: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_by: Mapped[str] = mapped_column(String(128))


class LexiconVersion(Base):
    """One row, its version raised by every change to the lexicon: what replicas poll (cheap, and exact
    whatever their clocks say) to know when to read the entries again."""

    __tablename__ = "lexicon_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)


class CalibrationRow(Base):
    """A model's calibration sweep as last measured on one machine with one set of the settings it depends on
    (tts_core.scheduler.calibration): a restart with the same reuses it instead of sweeping again first."""

    __tablename__ = "calibrations"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of `described`
    model: Mapped[str] = mapped_column(String(256))
    described: Mapped[str] = mapped_column(Text)  # JSON: the model, its settings and the machine the key is of
    rows: Mapped[str] = mapped_column(Text)  # JSON: [[batch size, padded tokens, seconds], ...]
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
