"""Pure decisions: what a run does next, windows, health verdicts, validation, access."""
