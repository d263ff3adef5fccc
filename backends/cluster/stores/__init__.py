"""What outlives a process: the registry file under `--state-dir` (`state_file`) and the stored
Responses (`response_db`: the SQLite schema; `responses`: the actor that owns it and its client)."""
