"""Host facts: what is there. One shell script, one SSH command per host, parsed on the controller."""
