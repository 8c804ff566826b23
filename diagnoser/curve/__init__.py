"""The operating curve of each pool read passively from a window's own history (issue 36).

`window` obtains the Frame (one function), `intervals` turns it into per-instance scrape
intervals, `points` buckets them by concurrency, `operating` reads the knee, C_max, usable RPS,
the Little's Law gap and headroom from the points, `changes` finds change events in the window,
`compare` judges each change at matched load, `report` assembles and renders the result.
Method and citations: docs/curve.md.
"""
