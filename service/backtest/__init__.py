"""`spec-advisor backtest`: recorded Prometheus history replayed through the advisor's own pipeline."""
