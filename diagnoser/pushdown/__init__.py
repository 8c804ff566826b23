"""Fleet diagnosis with the TSDB doing the work: rule conditions pushed down as PromQL
(prefilter.py), evidence fetched only where a rule fired, then the numpy evaluator (run.py)."""
