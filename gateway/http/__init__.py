"""The HTTP edge: error shapes, SSE framing, credentials for the routes outside the request
pipeline, and the middleware that ends requests whose clients left."""
