"""The Spark engine: the session, its casts, a batch's build and the copy as Spark jobs (``engines``)."""
