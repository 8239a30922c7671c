"""Fast tests: table-driven, synthetic trees made from real headers, no torch (see CONTRIBUTING.md)."""
