"""What decides: recipe.toml and the user's settings read and checked, then turned into the
run's plan, as data (launcher/plan/plan.py). Nothing here starts a container or reaches a
node; launcher/apply/ carries the plan out."""
