"""The command-line programs (absl flags): each parses its flags, refuses bad input in one
line before TensorFlow starts, and calls the library. It may import every package; no
package imports it.
"""
