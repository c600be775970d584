"""One module per CLI command group: argument parsers and the handlers that run them."""
