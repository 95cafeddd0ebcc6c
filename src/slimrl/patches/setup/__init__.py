"""Rule: what runs when a config or a trainer is built (checks, defaults, set-up wrappers); nothing inside a step."""
