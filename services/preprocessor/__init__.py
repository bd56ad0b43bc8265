"""Preprocessor: decodes and validates agent frames and chat requests into generate requests."""
