"""Request handlers: decode nothing, validate, call the gateway or a service, answer."""
