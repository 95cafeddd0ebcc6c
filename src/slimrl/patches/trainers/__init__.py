"""Rule: one module per TRL trainer (or family): its patches, as a list; its own code only where TRL has no seam."""
