"""Diagnosis rules as documents: schema, levers, validators and rule test cases."""
