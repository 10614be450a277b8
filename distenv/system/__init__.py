"""Linux plumbing: process trees and their ends, network interfaces, container markers.

What distenv reads from the kernel about processes (`processes`), the node's network interfaces
and routes (`netpath`) and the container it may run in (`containers`): no torch, no launcher.
"""
