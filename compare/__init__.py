"""scripts/compare: a reference setting booted twice (the A/A band) and a candidate once,
one at a time through the launcher, each measured by bench/ and judged in one verdict. It
stands above both: it imports the launcher (launcher/pipeline.py, the settings through
launcher/plan/load.py) and runs bench/'s tools as commands; neither imports it.

Modules: entry (scripts/compare's, run as a file), command (the command: options, the
report directory, the boots in order), sides (a side's words resolved and checked as run.sh
does), rundir (the report directory: what is saved, resumed or reused), boot (one boot: the
launcher's run, the measurements, the stop), results (the saved files summed up and the
verdict), report (compare.json, report.md and the picture). docs/compare.md says what it
does and why.
"""
