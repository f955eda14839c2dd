"""The launcher: recipe.toml read and checked, turned into the run's plan as data
(launcher/plan/), and the plan printed (DRY_RUN) or carried out (launcher/apply/) by run.sh,
stop.sh and scripts/doctor (entry: launcher/entry.py; the flow: launcher/pipeline.py)."""
