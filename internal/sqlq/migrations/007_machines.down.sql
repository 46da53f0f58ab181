-- Back to version 6: no stored machine definitions.
DROP TABLE {{schema}}.gendurable_machines;
