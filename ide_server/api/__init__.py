"""HTTP routes of the core components; thin handlers over `ide_server.services`."""
