"""What acts: the plan (launcher/plan/) carried out on the nodes (serve), or printed one
command a line (steps, DRY_RUN=1), and the helpers that reach a node while it runs."""
