"""The HTTP listener: the schema registry's REST API (Confluent's paths), and later
metrics and the web console. Built on Starlette and uvicorn, in the process's event loop;
it reaches the broker through the client, like any other client."""
