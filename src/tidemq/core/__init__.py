"""Pure building blocks shared by every layer: ids, errors, limits, clock, batch codec."""
