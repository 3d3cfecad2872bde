"""One request's pass: the scope that owns authenticate -> plan -> admit -> execute ->
settle -> log, its record, the response cache use, and the SSE body every stream shares."""
