"""The shared kernel: what agent, diagnoser, report and UI all read the same way.

The signal catalog and canonical samples (signals.py, catalog.yaml), one reader of each scalar
written as text and the time format (scalars.py), counter increases and the scrape interval
(rates.py), histogram quantiles (quantiles.py), latency objectives and goodput arithmetic
(objectives.py, goodput.py), and the network every client and listener shares (net.py, the one
outbound HTTP client; resolve.py; jsonbody.py). Nothing here imports another kvscope package."""
