"""Example applications of trioworker, each using only its public API."""
