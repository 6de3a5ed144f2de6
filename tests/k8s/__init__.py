"""Offline checks of k8s/ and the Dockerfile."""
