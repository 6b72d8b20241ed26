"""tidemq: stream storage for Python data teams."""
