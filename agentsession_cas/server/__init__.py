"""The RFC 0003 HTTP server."""
