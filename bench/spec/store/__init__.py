"""A results folder's writes, torch-free for bench and analysis alike: whole rows appended and torn ones set aside,
files renamed into place (files), one writer per folder (folder_lock). Imports nothing else of phasebench."""
