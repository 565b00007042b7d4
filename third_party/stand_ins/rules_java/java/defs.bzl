"""Forwards rules_java's public rules to Bazel's native ones (offline stand-in)."""

def java_binary(**attrs):
    native.java_binary(**attrs)

def java_import(**attrs):
    native.java_import(**attrs)

def java_library(**attrs):
    native.java_library(**attrs)

def java_plugin(**attrs):
    native.java_plugin(**attrs)

def java_test(**attrs):
    native.java_test(**attrs)

java_toolchain = native.java_toolchain
java_runtime = native.java_runtime
