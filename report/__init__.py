"""The weekly efficiency review (a presenter, like dashboards/ and ui/)."""
