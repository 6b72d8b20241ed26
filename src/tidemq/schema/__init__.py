"""Schemas: formats, Confluent's wire format, compatibility rules and the registry's
state (pure: no I/O). The registry's service and HTTP API build on it."""
