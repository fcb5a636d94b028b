"""phasebench.bench.sweep.spread: one sweep over several devices: shards of its cases (`run --shard K/N`), their
merge, and Ray actors that run the shards (`run --ray`)."""
