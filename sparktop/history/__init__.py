"""What happened while nobody watched: the history store (SQLite, a sample
per minute per node and engine, serving sessions, the event log), the
collector that writes it without a screen, the readers behind
`sparktop history` and the history screen, and the Prometheus exporter."""
