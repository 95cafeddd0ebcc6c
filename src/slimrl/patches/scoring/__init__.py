"""Rule: what runs inside a step's forwards: log-probs and losses over the rows, the long-context levers' seams."""
