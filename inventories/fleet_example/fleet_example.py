"""A mixed fleet: RTX PRO 6000 (SM120), B200 (SM100) and H200 (SM90) groups.

Group data lives beside this file, in group_data/<group>.py (its own folder, so nothing here
reaches inventories/ct200.py): one file per arch group below, and group_data/fleet_example.py,
which every host here shares (pyinfra makes the file's stem a group of all its hosts). The
addresses are documentation examples (RFC 5737).

Run: specfleet rollout inventories/fleet_example/fleet_example.py deploys/kimi_k26.py
"""

rtx6000 = [
    ("rtx-a1", {"ssh_hostname": "192.0.2.11"}),
    ("rtx-a2", {"ssh_hostname": "192.0.2.12"}),
]

b200 = [
    ("b200-01", {"ssh_hostname": "192.0.2.21"}),
    ("b200-02", {"ssh_hostname": "192.0.2.22"}),
    ("b200-03", {"ssh_hostname": "192.0.2.23"}),
    ("b200-04", {"ssh_hostname": "192.0.2.24"}),
]

h200 = [
    # 2x H200 would be too small for K2.6: preflight says so before anything changes.
    ("h200-01", {"ssh_hostname": "192.0.2.31", "specfleet": {"port": 30001}}),
]

# A serving group: two 8x H100 hosts run one server, tensor parallel over their 16 GPUs
# (group_data/h100_pair.py declares the group once, for both).
h100_pair = [
    ("h100-01", {"ssh_hostname": "192.0.2.41"}),
    ("h100-02", {"ssh_hostname": "192.0.2.42"}),
]
