"""Byte layouts of the store's files. Pure: structs, packing, validation; no I/O."""
