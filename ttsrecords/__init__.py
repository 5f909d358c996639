"""The on-disk contract between the stages of a run: what the load generator writes and the statistics, the report,
the simulator's fit and the tools read back.

Standard library only, so every side can import it: `records` (the record types, their one reader and the rules that
judge a block), `runsettings` (the settings a run fixes before it starts), `measures` (the metric table),
`samples` (the stored Prometheus sample keys and their sums),
`scenario` (the scenario file format), `manifest`, `windows` and `results` (the run's manifest, plan and statistics),
`cpuserver` (what the suite and the real CPU server, a process, agree on: its settings the manifest records).
"""
