"""`mtkit serve`: the stream, the scheduler and the HTTP app."""
