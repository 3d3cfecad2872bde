"""What lives as long as the process: state, the runtime snapshot and its reload, trackers,
logging, and the HTTP server."""
