"""Host facts: what is there. Providers (a command and its parser each) composed into one shell script, one SSH
command per host, parsed on the controller: providers.py (the model), base.py (the facts), schema.py (their types),
gather.py (the entry points)."""
