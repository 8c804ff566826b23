"""The numpy rule evaluator: frame on a grid, series expressions, conditions, ranking."""
