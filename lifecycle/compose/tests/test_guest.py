#!/usr/bin/env python3
import sys
print("SKIP: the guest stand-in test is not written yet")
sys.exit(77)
