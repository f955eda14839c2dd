"""The launcher: recipe.toml read, checked and turned into a plan run.sh, stop.sh and
scripts/doctor print or carry out (entry: launcher/entry.py)."""
