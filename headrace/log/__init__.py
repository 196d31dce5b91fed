"""The staged log: the staging codec (``codec``), the staging store its files live in (``store``)
and the log index that orders them per table (``index``)."""
