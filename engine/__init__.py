"""The MERGE engine: Delta Lake's MergeIntoCommand design, with all data work on Spark through Spark Connect.

The service uses only what this module exports.
"""
