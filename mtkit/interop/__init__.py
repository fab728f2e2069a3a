"""Other toolkits' formats: CTranslate2 export, and Marian models in the Hugging Face
layout, imported and exported side by side."""
