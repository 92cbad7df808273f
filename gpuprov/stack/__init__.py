"""The software stack: compatibility data, the resolver, the independent rule checker, lock files, host checks."""
