"""The top floor: fleet controllers (rollout, fan-out). They import only specfleet.core and
pyinfra, and run deploy files by path."""
